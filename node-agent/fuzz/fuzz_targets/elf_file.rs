//! An ELF file named in a workload's maps, as the unwinder (framehop over .eh_frame/.debug_frame) and the symboliser read it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| resourcewatch_agent::fuzzing::elf_file(data));
