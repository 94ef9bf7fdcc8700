"""Reading CSV files: options, type inference, byte ranges, quotes."""
