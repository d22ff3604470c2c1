# frozen_string_literal: true

require "rspec/expectations"
require "topology_claims/testing"

# RSpec matchers of claims, against the real server (`require "topology_claims/testing/rspec"`):
#   expect { user.save! }.to claim("usernames", "alice")       # by the configured cell
#   expect("cell-b").to have_claim("usernames", "bob")          # a cell id holds it, active
RSpec::Matchers.define :claim do |namespace, value, config: TopologyClaims.configuration|
  supports_block_expectations

  match do |block|
    @before = TopologyClaims::Testing.holder(namespace, value, config: config)
    block.call
    @after = TopologyClaims::Testing.holder(namespace, value, config: config)
    @before != @after && @after == [config.cell_id, :active]
  end

  failure_message do
    "expected the block to claim #{namespace} #{value.inspect} for #{config.cell_id}: held by " \
      "#{@before.inspect} before, #{@after.inspect} after"
  end
end

RSpec::Matchers.define :have_claim do |namespace, value, config: TopologyClaims.configuration|
  match do |cell_id|
    @holder = TopologyClaims::Testing.holder(namespace, value, config: config)
    @holder == [cell_id.to_s, :active]
  end

  failure_message do |cell_id|
    "expected #{cell_id} to hold #{namespace} #{value.inspect}, found #{@holder.inspect}"
  end
end
