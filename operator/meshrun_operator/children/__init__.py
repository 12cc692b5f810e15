"""The objects a job creates (Service, pods, PodGroup, NetworkPolicy) and the nodes they go to."""
