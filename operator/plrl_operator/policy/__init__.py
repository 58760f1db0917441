"""Pure decision logic shared by the operator and the local runner.

Nothing in this package does I/O or imports kopf, kubernetes, torch or grpc (import-linter checks).
"""
