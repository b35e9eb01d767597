"""One trial: the trial spec and ``run_trial`` (``train``), the LightningModule (``lit``), the model
(``model``), the trial's ``progress.csv`` (``running``) and stacked trials (``stack``)."""
