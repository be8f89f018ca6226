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
    kubectl sdc hardware [ID]                failure history by hardware identity
    kubectl sdc blast-radius NODE|TICKET     workloads a failing node served
    kubectl sdc migrate-storage              after an upgrade: store every object anew
    kubectl sdc completion bash|zsh          shell completion script

Global flags, before or after the command: --kubeconfig, --context, -o table|wide|json|yaml,
--no-headers. Installing it as a krew plugin: charts/krew/README.md.
"""

from sdcguard.cli.main import main

__all__ = ["main"]
