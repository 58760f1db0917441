"""The plrl runtime: generators, trainers, their gRPC protocol, weight sync and engines."""
