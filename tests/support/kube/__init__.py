"""The cluster tests' Kubernetes: a local control plane (cluster), laneway's processes
against it (laneway), and their parts."""
