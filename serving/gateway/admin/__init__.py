"""The operator's admin API (`api`): usage reports and runtime adapters, behind admin keys."""
