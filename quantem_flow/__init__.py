"""quantem-flow."""
