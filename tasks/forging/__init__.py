"""Paper 000 (forging sets), the one paper-specific room of ``tasks/``.

``exact``: closed-form volumes (linear regression, §3); ``bounds``: the paper's bounds (Props 2/4,
Thm 3, Cor 1/2, Remark 5, Thm 4/5, App. I); ``models``: the models whose gradients are forged;
``problems``: a forging set as a rare-event problem; ``estimators/``: volume estimators by name;
``slopes``: log-log slope fits; ``sgd``: the SGD trajectories of Fig. 1. The cell of the
``forging`` experiment is ``tasks/cells/forging.py``.
"""
