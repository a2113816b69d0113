"""Stacked two-layer ReLU nets (leading ensemble axis E) and their losses."""

from tasks.nets.losses import log_loss_terms, mean_log_loss
from tasks.nets.two_layer import TwoLayer, init_two_layer, robust_net, stack

__all__ = ["TwoLayer", "init_two_layer", "robust_net", "stack", "log_loss_terms", "mean_log_loss"]
