"""sdctrain: catch silent data corruption inside a data-parallel training job and
hand the suspect GPU's node to sdcguard. Needs only torch (no operator packages)."""

__version__ = "0.1.0"

from sdctrain.detection import Detection, Reporter
from sdctrain.guard import GuardConfig, Outcome, ReplicaSet, TrainingGuard
from sdctrain.verdicts import Confirmation, Method

__all__ = [
    "Confirmation",
    "Detection",
    "GuardConfig",
    "Method",
    "Outcome",
    "ReplicaSet",
    "Reporter",
    "TrainingGuard",
    "__version__",
]
