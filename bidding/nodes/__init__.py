"""Nodes: their profiles and queues, heartbeats and liveness, and running a federation of node
workers (with an embedded Redis for the demo)."""
