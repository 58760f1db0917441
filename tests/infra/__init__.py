"""Test infrastructure: the local Kubernetes control plane, fake GPU nodes and the node agent.

controlplane.py starts the processes and writes kubeconfigs; nodes.py builds fake GPU Node objects;
node_agent.py plays kubelet for pods bound to those nodes; cluster.py is `make cluster-up/down`.
"""
