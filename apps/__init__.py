"""Programs that drive both tiers: the `kvctl` control tool, `kvctl ask`, the demos."""
