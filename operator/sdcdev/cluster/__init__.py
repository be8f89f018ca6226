"""A local Kubernetes control plane and a real node, run as plain processes.

:mod:`~sdcdev.cluster.localcluster` starts etcd, kube-apiserver, controller-manager
and scheduler; :mod:`~sdcdev.cluster.realnode` adds containerd, a CNI bridge and a
kubelet; :mod:`~sdcdev.cluster.operator_pod` installs the chart onto that node;
:mod:`~sdcdev.cluster.helm` runs the helm binary built beside them.
"""
