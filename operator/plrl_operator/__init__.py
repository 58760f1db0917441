"""The Kubernetes side of plrl: the PipelineRLJob API, rendering, the kopf operator, the policy."""
