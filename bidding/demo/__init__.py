"""The example federation of seed 000 (redfin, bluefin, greenfin, sasass, tpm) and its tasks."""
