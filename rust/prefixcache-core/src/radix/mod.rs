//! SGLang RadixCache: token-level compressed radix tree (see SEMANTICS.md section 1).
