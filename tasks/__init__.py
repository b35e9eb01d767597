"""Synthetic tasks: Parity, Keep-nth, MQAR, k-hop, group word problems, modular counting, modular
arithmetic (with and without brackets),
the length-extrapolation protocol and a ``LightningDataModule``.

    from tasks import get_task, TASKS
    task = get_task("parity", seq_len=100)
    data = task.generate(num_samples, seed=0)   # TaskData(inputs, targets)
"""

from tasks.base import IGNORE_INDEX, TASKS, Task, TaskData, get_task, make_generator, register_task
from tasks.datamodule import SyntheticDataModule
from tasks.extrapolation import ExtrapolationConfig, generate_variable_length
from tasks.keep_nth import KeepNth
from tasks.khop import KHop
from tasks.modular_arithmetic import ModularArithmetic, ModularArithmeticBrackets
from tasks.modular_count import ModularCount
from tasks.mqar import MQAR
from tasks.parity import Parity
from tasks.word_problem import WordProblem

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "Task",
    "TaskData",
    "get_task",
    "make_generator",
    "register_task",
    "SyntheticDataModule",
    "ExtrapolationConfig",
    "generate_variable_length",
    "KeepNth",
    "KHop",
    "ModularArithmetic",
    "ModularArithmeticBrackets",
    "ModularCount",
    "MQAR",
    "Parity",
    "WordProblem",
]
