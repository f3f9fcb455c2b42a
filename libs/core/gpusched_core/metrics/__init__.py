"""The metrics room's pure decisions: utilisation views over a cluster snapshot and telemetry (``views``)
and the scaler that turns sustained unmet demand or idle capacity into scale decisions (``scaling``)."""
