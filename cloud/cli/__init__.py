"""The cloud tier's `kvctl` command groups (one module each); `kvedge.apps.kvctl` adds them."""
