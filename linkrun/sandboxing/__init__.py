"""The sandbox: the sandbox file's fixed argv, the per-call part, one launch, the filter, the cgroups."""
