"""A cost model learned from the fleet's own results: rank a problem's candidates, measure only the best few.

    farm model train RUN... --out model.json     # farm.costmodel.examples -> farm.costmodel.model
    farm tune W.yaml --prune model.json          # farm.costmodel.pruning, in the driver's planning
    farm model eval RUN... --holdout family      # farm.costmodel.evaluation

LightGBM is an optional extra (``tunefarm[model]``); without it nothing here is imported by the farm.
"""

from farm.costmodel.examples import ProblemTimes, TrainingSet, family_of, load_training_set
from farm.costmodel.model import CostModel
from farm.costmodel.pruning import PruneChoice, Pruner, choose

__all__ = ["CostModel", "ProblemTimes", "PruneChoice", "Pruner", "TrainingSet", "choose", "family_of",
           "load_training_set"]
