"""verl's experimental entry points under their verl names, so its launch scripts run with the module renamed."""
