# Pure logic shared by the collection's modules and filters and the moefleet CLI, all of which import it as
# ansible_collections.moefleet.serving.plugins.module_utils.<name>. Files here use only the standard library
# and do no I/O of their own.
