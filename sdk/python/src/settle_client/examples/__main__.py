"""``python -m settle_client.examples`` lists the examples."""

print(
    "examples (each with --help): python -m settle_client.examples.payments (Starlette), "
    "settle_client.examples.flask_payments (Flask), settle_client.examples.django_payments (Django)"
)
