"""The recorder (Redis Streams -> PostgreSQL history) and the repair loops."""
