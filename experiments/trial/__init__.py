"""One trial: the trial spec and ``run_trial`` (``train``), the LightningModule (``lit``; its form with
captured steps for the graph engines: ``captured``), the model (``model``), the trial's ``progress.csv``
(``running``), stacked trials (``stack``) and the defaults of the model's shape and precision
(``defaults``)."""
