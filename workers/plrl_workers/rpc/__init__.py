"""gRPC protocol between generators and the coordinator (trainer rank 0)."""
