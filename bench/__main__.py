"""`python -m kvedge.bench`: the `kvctl bench` commands (kvedge.bench.cli)."""
from kvedge.bench.cli import bench

bench()
