"""Pure numerical kernels (torch only). Every kernel works on a stack of E networks."""
