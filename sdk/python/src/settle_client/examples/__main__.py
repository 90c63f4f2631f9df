"""``python -m settle_client.examples`` lists the examples."""

print("examples: python -m settle_client.examples.payments --help")
