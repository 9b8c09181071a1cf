"""What operators see that Flower cannot: ``explain`` (every bid and score of an award),
``status`` (where a task stands, its cost) and ``stats`` (seed 000's monitoring queries); and
seed 002's watch of delegated work (``watch``, ``checking``, ``monitor``, ``reset``)."""
