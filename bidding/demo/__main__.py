"""``python -m bidding.demo``: run the example federation end to end."""

from bidding.demo.run import main

raise SystemExit(main())
