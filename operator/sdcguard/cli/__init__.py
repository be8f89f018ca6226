"""``kubectl sdc``: the sdcguard kubectl plugin (console script ``kubectl-sdc``).

::

    kubectl sdc status                       fleet by state and pool, breakers, open tickets
    kubectl sdc test NODE [--suite S] [--seed N] [--data-seed M]
                                             screen a node now (an SDCTest, reason Manual);
                                             --seed pins the baseline rounds' seed,
                                             --data-seed that of every later round
    kubectl sdc quarantine NODE --reason R   ask the operator to quarantine a node
    kubectl sdc release NODE --reason R      ask the operator to return a node to service
    kubectl sdc repaired TICKET --note N     record the repair side's resolution
    kubectl sdc history NODE                 tests (with seeds), tickets and events of a node,
                                             by time, and the seeds it has passed
    kubectl sdc baselines                    golden-value baselines per fingerprint
"""

from sdcguard.cli.main import main

__all__ = ["main"]
