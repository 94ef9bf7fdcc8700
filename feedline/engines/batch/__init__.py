"""What every engine runs per batch: fused operators, column edits, partial merges."""
