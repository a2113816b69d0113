"""Training of stacked nets: log-space GD/SGD of paper 002 (``gd``), lazy SGD and projected
adversarial training of paper 003 (``lazy_sgd``, ``projected_adv``)."""

from tasks.train.gd import (CONVERGED, DEAD, DIVERGED, MAX_ITERS, RUNNING, STATE_FIELDS, STATUS_NAMES, Schedule,
                            TrainState, auto_chunk, init_state, train)
from tasks.train.lazy_sgd import LazyRun, lazy_sgd
from tasks.train.projected_adv import AdvRun, projected_adv_train
from tasks.train.state_io import check_state, state_from_dict, state_to_dict

TRAINERS = {"lazy_sgd": lazy_sgd, "projected_adv_train": projected_adv_train}

__all__ = ["CONVERGED", "DEAD", "DIVERGED", "MAX_ITERS", "RUNNING", "STATE_FIELDS", "STATUS_NAMES", "Schedule",
           "TrainState", "auto_chunk", "check_state", "init_state", "state_from_dict", "state_to_dict", "train",
           "AdvRun", "LazyRun", "TRAINERS", "lazy_sgd", "projected_adv_train"]
