# Pure logic shared by the Ansible modules (as ansible.module_utils.<name>) and the moefleet CLI
# (as moefleet.logic.<name>). Files here use only the standard library and do no I/O of their own.
