"""Deployment profiles (model x GPU x precision x context) as validated data."""

from serving.profiles.loader import builtin_profile_names, load_all_profiles, load_profile
from serving.profiles.model import Profile

__all__ = ["Profile", "builtin_profile_names", "load_all_profiles", "load_profile"]
