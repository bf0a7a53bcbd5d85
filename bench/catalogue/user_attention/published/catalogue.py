"""Attention classes copied unchanged from public code many readers copy (README.md says from where, at which
commit): which file holds which class, its family as the code reads (what `diagnose.py --attention` must find), and
whether the published code is correct. A specimen is never edited to fit the product: one the product cannot take
is counted as the product's failure (bench/own_attention.py --published).

Fields:
    file, class_name  the class
    source            who published it (the repository)
    family            the family a reader of the code sees: causal, positions (rope / bias), pre-norm / post-norm,
                      fused (F.scaled_dot_product_attention or nn.MultiheadAttention), plain
    correct           True where the published code computes attention right; False names the mistake found in it
    needs             modules it imports beyond torch (a missing one skips it in the tests, counts in the bench)
"""

CH03 = "rasbt/LLMs-from-scratch"


def entry(file, class_name, source, family, correct=True, needs=(), mistake=""):
    return {"file": f"published/{file}", "class_name": class_name, "source": source, "family": family,
            "correct": correct, "needs": tuple(needs), "mistake": mistake, "args": None,
            "expected": () if correct else ("look-ahead", "padding", "permutation", "formula")}


PUBLISHED = [
    entry("nanogpt.py", "CausalSelfAttention", "karpathy/nanoGPT", ("causal", "fused")),
    entry("mingpt.py", "CausalSelfAttention", "karpathy/minGPT", ("causal",)),
    entry("llms_from_scratch_ch03.py", "SelfAttention_v1", CH03, ("plain",)),
    entry("llms_from_scratch_ch03.py", "SelfAttention_v2", CH03, ("plain",)),
    entry("llms_from_scratch_ch03.py", "CausalAttention", CH03, ("causal",)),
    entry("llms_from_scratch_ch03.py", "MultiHeadAttentionWrapper", CH03, ("causal",)),
    entry("llms_from_scratch_ch03.py", "MultiHeadAttention", CH03, ("causal",)),
    entry("llms_from_scratch_ch03.py", "PyTorchMultiHeadAttention", CH03, ("causal", "fused")),
    entry("mha_implementations.py", "Ch03_MHA_Wrapper", CH03, ("causal",)),
    entry("mha_implementations.py", "Ch03_MHA", CH03, ("causal",)),
    entry("mha_implementations.py", "MultiHeadAttentionCombinedQKV", CH03, ("causal",)),
    entry("mha_implementations.py", "MHAEinsum", CH03, ("causal",)),
    entry("mha_implementations.py", "MHAPyTorchScaledDotProduct", CH03, ("causal", "fused")),
    entry("mha_implementations.py", "MHAPyTorchSDPAWithoutFlash", CH03, ("causal", "fused"), correct=False,
          mistake="torch.triu(ones, diagonal=1).bool() (True above the diagonal) passed as SDPA's attn_mask, where "
                  "True means 'may attend': each query sees only the tokens after it, never itself, the last none"),
    entry("mha_implementations.py", "MHAPyTorchClass", CH03, ("causal", "fused")),
    entry("llama2_rope.py", "MultiHeadAttention", CH03, ("causal", "positions")),
    entry("annotated_transformer.py", "MultiHeadedAttention", "harvardnlp/annotated-transformer", ("plain",)),
    entry("vit.py", "Attention", "lucidrains/vit-pytorch", ("pre-norm",), needs=("einops",)),
    entry("simple_vit.py", "Attention", "lucidrains/vit-pytorch", ("pre-norm",), needs=("einops",)),
    entry("llama.py", "Attention", "meta-llama/llama", ("causal", "positions"), needs=("fairscale",)),
    entry("attention_is_all_you_need.py", "MultiHeadAttention", "jadore801120/attention-is-all-you-need-pytorch",
          ("post-norm",)),
]
