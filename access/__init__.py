"""The one access policy (access/policy.py): who may see and do what, asked by every surface."""
