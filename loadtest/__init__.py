"""Load testing of the serving stack with Locust: LLM users, workloads, targets and reports."""
