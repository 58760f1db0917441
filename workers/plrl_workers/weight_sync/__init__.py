"""Moving weights from trainer rank 0 to generators: collective broadcast plus a gRPC pull path."""
