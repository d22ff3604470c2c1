# frozen_string_literal: true

module TopologyClaims
  # The gem's lowercase names (:username) for the proto's enum values (CLAIM_TYPE_USERNAME),
  # read from the generated enums, and the open names of owner types and source tables.
  module Names
    module_function

    def claim_type(name) = value(V1::ClaimRecord::ClaimType, "CLAIM_TYPE_", name, "claim type")

    # The built-in namespaces the legacy claim types stand for (ClaimRecord.claim_type 1, 2, 3).
    BUILTIN_NAMESPACES = { "routes" => "routes", "username" => "usernames", "email" => "emails" }.freeze

    # The namespace a legacy `type:` (:username, :email, :routes) stands for; nil for nil.
    def namespace_of_type(type)
      return nil if type.nil?

      claim_type(type) # refuses an unknown type, listing the known ones
      BUILTIN_NAMESPACES.fetch(type.to_s.downcase)
    end
    # The fields of an owner type and a source table in a ClaimRecord (or a ListClaimsRequest's
    # table): the name (any; the server decides what it takes, decision 111), and the legacy
    # enum beside it where there is one, so that a server from before open names reads the
    # legacy ones as it always did.
    def owner_fields(name)
      name = name.to_s
      { owner_type: name, owner: legacy(V1::ClaimRecord::Owner, "OWNER_", name) }
    end

    def table_fields(name)
      name = name.to_s
      { source_table: name, table_name: legacy(V1::ClaimRecord::TableName, "TABLE_NAME_", name) }
    end

    def legacy(enum, prefix, name)
      return 0 unless /\A[a-z0-9_]+\z/.match?(name)

      symbol = :"#{prefix}#{name.upcase}"
      enum.resolve(symbol) ? symbol : 0
    end

    # The lowercase name of a proto enum symbol (:CLAIM_TYPE_EMAIL => "email").
    def short(symbol)
      symbol.to_s.sub(/\A(CLAIM_TYPE|OWNER|TABLE_NAME|CLAIM_STATE)_/, "").downcase
    end

    def value(enum, prefix, name, what)
      symbol = :"#{prefix}#{name.to_s.upcase}"
      return symbol if enum.resolve(symbol) && !symbol.to_s.end_with?("UNSPECIFIED")

      allowed = enum.constants.map(&:to_s).grep(/\A#{prefix}/).reject { |c| c.end_with?("UNSPECIFIED") }
                    .map { |c| c.delete_prefix(prefix).downcase }
      raise ArgumentError, "#{name.inspect} is not a #{what} of topology.claims.v1 (one of #{allowed.join(', ')})"
    end
  end
end
