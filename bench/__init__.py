"""kvedge.bench: benchmark datasets, the method x budget runner and its reports."""
