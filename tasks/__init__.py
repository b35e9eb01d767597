"""Synthetic tasks: Parity, Keep-nth, MQAR, k-hop, group word problems, modular counting, modular
arithmetic (with and without brackets), the other twelve tasks of Deletang et al. 2023 (even pairs,
cycle navigation, reverse string, stack manipulation, solve equation, duplicate string, missing
duplicate, odds first, binary addition and multiplication, compute sqrt, bucket sort; string answers
after the input: ``tasks.transduction``),
the length-extrapolation protocol and a ``LightningDataModule``.

    from tasks import get_task, TASKS
    task = get_task("parity", seq_len=100)
    data = task.generate(num_samples, seed=0)   # TaskData(inputs, targets)
"""

from tasks.base import IGNORE_INDEX, TASKS, Task, TaskData, get_task, make_generator, register_task
from tasks.binary_arithmetic import BinaryAddition, BinaryMultiplication, ComputeSqrt
from tasks.cycle_navigation import CycleNavigation
from tasks.datamodule import SyntheticDataModule
from tasks.even_pairs import EvenPairs
from tasks.extrapolation import ExtrapolationConfig, generate_variable_length
from tasks.keep_nth import KeepNth
from tasks.khop import KHop
from tasks.missing_duplicate import MissingDuplicate
from tasks.modular_arithmetic import ModularArithmetic, ModularArithmeticBrackets
from tasks.modular_count import ModularCount
from tasks.mqar import MQAR
from tasks.parity import Parity
from tasks.solve_equation import SolveEquation
from tasks.stack_manipulation import StackManipulation
from tasks.transduction import BucketSort, DuplicateString, OddsFirst, ReverseString, Transduction
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
    "BinaryAddition",
    "BinaryMultiplication",
    "BucketSort",
    "ComputeSqrt",
    "CycleNavigation",
    "DuplicateString",
    "EvenPairs",
    "KeepNth",
    "KHop",
    "ModularArithmetic",
    "ModularArithmeticBrackets",
    "MissingDuplicate",
    "ModularCount",
    "MQAR",
    "OddsFirst",
    "Parity",
    "ReverseString",
    "SolveEquation",
    "StackManipulation",
    "Transduction",
    "WordProblem",
]
