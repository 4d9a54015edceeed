#!/usr/bin/python
# Test-only module: returns the facts it is given, so a play can pretend to run on another OS without one.
from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec=dict(facts=dict(type="dict", required=True)), supports_check_mode=True)
    module.exit_json(changed=False, ansible_facts=module.params["facts"])


if __name__ == "__main__":
    main()
