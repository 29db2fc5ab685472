//! vLLM v1 block pool, free queue and request-level manager (see SEMANTICS.md section 2).
