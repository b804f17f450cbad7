"""Kubernetes: the engine patch each kustomize overlay applies, generated from its profile.

`serving k8s render` (serving/k8s/command.py) writes `k8s/overlays/<overlay>/
engine.generated.yaml`; the rest of `k8s/` is hand-written kustomize.
"""
