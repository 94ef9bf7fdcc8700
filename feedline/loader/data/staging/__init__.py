"""``cache="staged"``: each epoch's rows staged ahead in each rank's read order."""
