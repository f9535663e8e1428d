"""flywheel's LoRA resolver, a vLLM general plugin (entry point ``flywheel_lora_resolver``).

``flywheel serve vllm`` names it in ``VLLM_PLUGINS`` and sets the fetch command,
the cache and the served base model in the environment (see :mod:`.fetch`);
vLLM then asks it for any adapter name it does not serve, on that name's first
request. Without that environment, :func:`register` does nothing, so installing
the plugin changes nothing for a vLLM started otherwise.

A second entry point, ``flywheel_cpu_lora``, puts :mod:`.cpu_lora`'s LoRA ops in
place of vLLM's on the CPU backend (the same result, one matrix product per
adapter instead of one per token); on any other platform it does nothing.

A third, ``flywheel_cpu_seeded``, keeps a request with a ``seed`` from killing vLLM's CPU
engine (:mod:`.cpu_seeded`); on any other platform it does nothing.
"""

from __future__ import annotations

PLUGIN_NAME = "flywheel_lora_resolver"
# The second plugin: vLLM's CPU LoRA ops, grouped by adapter (:mod:`.cpu_lora`).
CPU_LORA_PLUGIN_NAME = "flywheel_cpu_lora"
# The third: seeded requests on the CPU backend (:mod:`.cpu_seeded`).
CPU_SEEDED_PLUGIN_NAME = "flywheel_cpu_seeded"
# Under vLLM's own logger, so its handler and format (and level) apply to these lines.
LOGGER_NAME = "vllm.plugins.flywheel_lora_resolver"


def register() -> None:
    """vLLM's plugin hook: register the resolver when `flywheel serve vllm` configured it."""
    # vLLM imports stay here, at the edge: the fetch logic is tested without vLLM.
    from vllm.logger import init_logger
    from vllm.lora.resolver import LoRAResolverRegistry

    from flywheel_vllm_resolver.fetch import FetchSettings, ResolverConfigError
    from flywheel_vllm_resolver.resolver import FlywheelResolver

    logger = init_logger(LOGGER_NAME)
    try:
        settings = FetchSettings.from_env()
    except ResolverConfigError as exc:
        logger.error("flywheel's LoRA resolver is not registered: %s", exc)
        return
    if settings is None:
        logger.debug("flywheel's LoRA resolver is not configured (no fetch command)")
        return
    LoRAResolverRegistry.register_resolver("flywheel", FlywheelResolver(settings))
    logger.info("flywheel's LoRA resolver registered: adapters fetched into %s", settings.cache_dir)


def register_cpu_lora() -> None:
    """vLLM's plugin hook: on the CPU backend, LoRA ops grouped by adapter (:mod:`.cpu_lora`)."""
    from vllm.logger import init_logger
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import vllm.lora.ops.torch_ops.lora_ops as torch_ops
    from vllm.lora.punica_wrapper import punica_cpu

    from flywheel_vllm_resolver.cpu_lora import install, install_wrapper

    replaced = install(torch_ops, punica_cpu) + install_wrapper(punica_cpu.PunicaWrapperCPU)
    init_logger(f"vllm.plugins.{CPU_LORA_PLUGIN_NAME}").info(
        "flywheel's CPU LoRA ops in place of %s", ", ".join(replaced)
    )


def register_cpu_seeded() -> None:
    """vLLM's plugin hook: on the CPU backend, generators a seeded request's discarded token can
    rewind (:mod:`.cpu_seeded`)."""
    from vllm.logger import init_logger
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.worker.gpu_input_batch import InputBatch

    from flywheel_vllm_resolver.cpu_seeded import install

    patched = install(InputBatch)
    init_logger(f"vllm.plugins.{CPU_SEEDED_PLUGIN_NAME}").info(
        "flywheel's rewindable CPU generators for seeded requests in %s", patched
    )
