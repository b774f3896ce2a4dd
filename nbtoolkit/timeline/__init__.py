"""The timeline widget machinery (levels of detail for millions of events) that trace and memory use."""
