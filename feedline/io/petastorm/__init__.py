"""Reading Petastorm datasets without Petastorm."""
