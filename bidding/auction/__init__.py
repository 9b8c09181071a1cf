"""The auction (DESIGN section 4): announce a task, pick candidates, collect or make the bids,
decide and commit the award, and keep every announced task moving (sweeper, watchdog)."""
