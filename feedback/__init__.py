"""Event model, feedback store, importers, simulation, PII scrubbing, dedup and datasets."""
