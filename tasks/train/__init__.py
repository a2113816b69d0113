"""Training of stacked nets: log-space GD/SGD of paper 002 (``gd``)."""

from tasks.train.gd import (CONVERGED, DEAD, DIVERGED, MAX_ITERS, RUNNING, STATE_FIELDS, STATUS_NAMES, Schedule,
                            TrainState, auto_chunk, check_state, init_state, state_from_dict, state_to_dict, train)

__all__ = ["CONVERGED", "DEAD", "DIVERGED", "MAX_ITERS", "RUNNING", "STATE_FIELDS", "STATUS_NAMES", "Schedule",
           "TrainState", "auto_chunk", "check_state", "init_state", "state_from_dict", "state_to_dict", "train"]
