"""Models, end to end: capture a PyTorch model's operations into a workload, route an unmodified model's calls
to the decisions tuned for them, and check those decisions on the model's own step.

    with farm.capture(model) as c:        # farm.nn.capturing: the ops a step calls, how often, its share
        model(x)
    c.write("workload.yaml")              # farm tune workload.yaml --out runs/m
    model = farm.apply(model, "runs/m")   # farm.nn.routing: only non-default decisions are routed
    farm.unapply(model)

``farm apply TARGET RUN`` (the CLI) applies and runs the model check (farm.nn.step_check): the step with and
without each decision, in paired rounds; what makes it slower is withdrawn where the decisions live
(farm.nn.step_record). torch is imported only when one of these is used.
"""

from farm.nn.routing import Applied, applied_to, apply, unapply
from farm.nn.capturing import Capture, capture
from farm.nn.captured import CapturedWorkload, merge
from farm.nn.step_check import CheckSettings, StepCheck, check_step

__all__ = ["Applied", "Capture", "CapturedWorkload", "CheckSettings", "StepCheck", "applied_to", "apply", "capture",
           "check_step", "merge", "unapply"]
